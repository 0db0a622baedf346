"""The gRPC door: the Open Inference Protocol's ``GRPCInferenceService`` on grpcio's asyncio
server."""
