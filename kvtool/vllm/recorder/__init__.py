"""KV_Catch inside vLLM: the recorder (``recorder``), its hooks on one scheduler (``hooks``), the background
writer (``writer``), the vLLM general plugin (``plugin``) and ``kvtool record``'s launcher (``launch``).

Everything here except ``launch`` runs inside vLLM's engine-core process and imports only the standard library."""
