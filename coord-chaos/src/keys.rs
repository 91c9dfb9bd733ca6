//! The keys and values of coord's own nodes (`CoordService`): where they register, what they
//! campaign in, what their leaders write, and how their metadata reads; shared by the nodes
//! and the checkers that read their history.

use crate::history::Incarnation;

/// The prefix every node registers under.
pub const HOSTS: &str = "hosts/";

/// The name of election `e`.
pub fn election_name(e: usize) -> String {
    format!("elections/e{e}")
}

/// The key leaders of election `e` write through the fence.
pub fn work_key(e: usize) -> String {
    format!("work/{}/token", election_name(e))
}

/// The key node `node` registers.
pub fn host_key(node: usize) -> String {
    let mut key = String::with_capacity(HOSTS.len() + 8);
    key.push_str(HOSTS);
    key.push('n');
    push_decimal(&mut key, node as u64);
    key
}

/// The metadata a node registers: who it is, and a generation that grows with each update.
/// Written as `format!("{who}#{generation}")` would, without the formatting machinery: at
/// 1,000 hosts these two strings were one and a half percent of a simulated second.
pub(crate) fn metadata(who: Incarnation, generation: u64) -> String {
    let mut value = String::with_capacity(24);
    value.push('n');
    push_decimal(&mut value, who.node as u64);
    value.push('.');
    push_decimal(&mut value, who.inc as u64);
    value.push('#');
    push_decimal(&mut value, generation);
    value
}

/// Appends `n` in decimal.
fn push_decimal(s: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.push_str(std::str::from_utf8(&digits[at..]).expect("ASCII digits"));
}

/// The generation of a node's metadata (see [`metadata`]).
pub(crate) fn metadata_generation(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value)
        .ok()?
        .rsplit_once('#')?
        .1
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_metadata_read_as_their_formats_would() {
        for (node, inc, generation) in [
            (0, 0, 0),
            (7, 12, 9),
            (999, 3, 10),
            (usize::MAX >> 40, u32::MAX as _, u64::MAX),
        ] {
            let who = Incarnation { node, inc };
            assert_eq!(metadata(who, generation), format!("{who}#{generation}"));
            assert_eq!(host_key(node), format!("{HOSTS}n{node}"));
            assert_eq!(
                metadata_generation(metadata(who, generation).as_bytes()),
                Some(generation)
            );
        }
    }
}
