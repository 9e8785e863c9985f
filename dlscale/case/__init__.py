"""A case and its launch: the configuration, suites, the repeat loop, process trees, multi-node, batch search."""
