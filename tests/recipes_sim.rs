//! The recipe cases on `SimStore`, in virtual time: deterministic, and a 10 s TTL passes in
//! no wall time. Faults: `close_streams`, a client cut off through its own handle, latency.

#[path = "recipes/sim_fixture.rs"]
mod sim_fixture;

use sim_fixture::{in_virtual_time, run, SimFixture};

coord_api::recipe_tests!(run);
coord_api::typed_recipe_tests!(run);

/// Every case again, through a namespace (`Namespaced`).
mod namespaced {
    use super::*;
    use coord_api::testkit::recipes::{Case, InNamespace};

    fn run(case: Case) {
        in_virtual_time(async { case(&InNamespace::new(SimFixture::new(), "tenant/")).await });
    }

    coord_api::recipe_tests!(run);
    coord_api::typed_recipe_tests!(run);
}
