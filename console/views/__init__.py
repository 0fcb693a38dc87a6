"""Console views: plain functions that parse, check access, call a service and render."""
