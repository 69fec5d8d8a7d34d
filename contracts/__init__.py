"""Orrery's wire and file formats: pydantic models, ids and digests.

`contracts` imports only pydantic and the standard library, and nothing of Orrery's
other packages. Everything that crosses a package or process boundary is defined here.
"""
