"""The living demo: demo accounts, a local webhook receiver, and the agent-run simulator.

Nothing here is imported by the product itself: `manage.py serve` (unless `--no-demo`) calls
`demo_setup` and starts `manage.py simulate`, which drive the console the way real agent
runtimes and reviewers would — over HTTP and websockets, through `safestop_agent`.
"""
