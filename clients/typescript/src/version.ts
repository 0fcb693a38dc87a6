/**
 * The wire contract version this client speaks (DESIGN §5, §10). It moves with the Python
 * `safestop_agent.__version__`: 0.2 is the first contract where a permit may answer `202` with
 * an approval to wait for. Every request names it (`Safestop-Agent-Version`), so a server that
 * needs a newer contract answers `426 client_too_old` instead of being misunderstood.
 */
export const VERSION = "0.2.0";
export const VERSION_HEADER = "Safestop-Agent-Version";
export const USER_AGENT = `safestop-agent-ts/${VERSION} node/${process.versions.node}`;
