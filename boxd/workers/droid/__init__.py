"""The Droid worker: Factory's Droid CLI driven over JSON-RPC (rpc), what it is started with
(config), its notifications read as steps (events), and its own requests answered (answers)."""
