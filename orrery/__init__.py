"""Composition only: the `orrery` CLI, the embedded and server stacks, the HTTP app.

`ingest`, `projector` and `query` never import each other; this package imports them,
picks adapters through their bootstraps and wires them into processes. It holds no
domain logic: a rule about records, indexes or ranking belongs in one of the packages.
"""
