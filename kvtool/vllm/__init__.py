"""vLLM itself: its KV events (``events``), the recorder that runs inside it (``recorder``), tenant isolation
on a real engine (``isolation``).  Each subpackage is a capability; ``events`` is the only one the others share."""
