"""sc-integration: test support for the workspace's cross-package tests (never published).

:class:`~sc_integration._standing_cluster.StandingCluster` starts a Ray cluster the way an
operator does (``ray start --head``) for the tests of detached runs and re-attach, and
:class:`~sc_integration._cluster_node.ClusterNode` joins a second node to it
(``ray start --address``) that the node-loss tests lose; the trainer itself is the
published distribution ``sc-trainer``.
"""
