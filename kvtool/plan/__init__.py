"""``kvtool plan``: from a workload to the GPUs, parallelism and settings that hold it, cheapest first."""
