//! A private Citus cluster for tools: a coordinator and workers, each a
//! private [`Server`] that preloads `citus`, prepared as `scripts/citus up`
//! prepares its fixed one: the extension in the `postgres` database of
//! every node, the coordinator's host set and the workers added there. A
//! database for the service is then made with
//! [`TestDatabase::empty_on`](crate::TestDatabase::empty_on) on the
//! coordinator's `postgres` database: on every node, the nodes registered
//! in it too.
//! The `citus` extension must be installed (`scripts/citus up` builds it).

use crate::db::connect;
use crate::Server;

/// What a Citus node adds to a private server's settings: two-phase commit
/// for writes to reference tables, background workers for each database's
/// maintenance daemon.
const SETTINGS: &str = "shared_preload_libraries = 'citus'\n\
                        max_prepared_transactions = 100\n\
                        max_worker_processes = 32\n";

/// The coordinator and the workers; dropping it stops and removes them.
pub struct Citus {
    pub coordinator: Server,
    pub workers: Vec<Server>,
}

impl Citus {
    /// Starts a coordinator and `workers` workers at once and registers the
    /// workers.
    pub async fn start(workers: usize) -> Self {
        let starts: Vec<_> = (0..=workers)
            .map(|_| tokio::spawn(Server::start_with(SETTINGS)))
            .collect();
        let mut nodes = Vec::new();
        for start in starts {
            nodes.push(start.await.expect("a Citus node's start"));
        }
        let coordinator = nodes.remove(0);
        for node in std::iter::once(&coordinator).chain(&nodes) {
            node.node()
                .connect("postgres")
                .await
                .batch_execute("CREATE EXTENSION citus")
                .await
                .expect("CREATE EXTENSION citus (is Citus installed? scripts/citus up builds it)");
        }
        let admin = connect(&coordinator.node().url("postgres")).await;
        let register = std::iter::once(("citus_set_coordinator_host", &coordinator))
            .chain(nodes.iter().map(|worker| ("citus_add_node", worker)));
        for (function, node) in register {
            let port = i32::from(node.node().port());
            admin
                .query_one(&format!("SELECT {function}('127.0.0.1', $1)"), &[&port])
                .await
                .unwrap_or_else(|e| panic!("{function} for port {port}: {e:?}"));
        }
        Self {
            coordinator,
            workers: nodes,
        }
    }
}
