"""Multi-node: the sidecars of one engine group find each other and answer the leader."""
