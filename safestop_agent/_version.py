"""The package's version, which is also the version of the wire contract it speaks.

The minor version moves with the contract (DESIGN §5, §10): 0.2 is the first
client that understands a permit answered `202` with an approval to wait for.
Every request says which version it is (`Safestop-Agent-Version`, and in the
`User-Agent`), so a server whose contract this client predates answers
`426 client_too_old` with the minimum it accepts instead of misbehaving.
"""

from __future__ import annotations

__version__ = "0.2.0"

# The request header that carries `__version__` (the User-Agent says it too).
VERSION_HEADER = "Safestop-Agent-Version"
USER_AGENT = f"safestop-agent/{__version__}"
