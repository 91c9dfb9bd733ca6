//! coord-etcd: the production etcd backend. In progress (see the etcd issue); this crate is a placeholder so the workspace has its final shape.
