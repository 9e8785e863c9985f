"""Results and their validity: the record, the store, statistics and MFU, validity checks, loss parity, goodput, the environment."""
