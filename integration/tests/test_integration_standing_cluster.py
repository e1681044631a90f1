"""The standing cluster's ports: ``ray start`` refuses a component port inside the worker range."""

from __future__ import annotations

from sc_integration._standing_cluster import cluster_ports


def test_component_ports_are_distinct_and_outside_the_worker_range() -> None:
    # drawn many times: a draw that ignored the range would collide within a few hundred tries
    for _ in range(300):
        ports, workers = cluster_ports(7)
        assert len(ports) == 7
        assert len(set(ports)) == 7
        assert not any(port in workers for port in ports)
        assert len(workers) == 201
        assert workers.stop - 1 <= 65535
