"""The planner: the memory plan, the device layout it plans for, `dlscale plan` and its check against measured peaks."""
