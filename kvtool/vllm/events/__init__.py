"""vLLM's own KV-cache events: the ZMQ wire format (``wire``), ``kvtool capture`` (``capture``), what an event
file can show about the prefix cache (``analysis``), and their rendering (``render``)."""
