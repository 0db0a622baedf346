"""The Open Inference Protocol (KServe v2): its request and response codec, independent of
the transport that carries it."""
