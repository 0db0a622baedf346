"""The transport-free request path every door shares: decode, admit, batch, infer."""
