"""Read queries for the console pages, one module per page: `runs`, `run`, `packets`,
`needs_me` (and the navigation's counts), `audit`, `quality`, `tokens`, and `metrics` (the
console's figures for `/metrics`). The handoff inbox reads are `handoff.selectors`.

Each page makes a fixed number of queries, whatever the number of rows: lists are fetched in one
query each and joined in Python, never per row."""
