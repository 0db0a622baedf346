"""The models a server holds: the registry, loading and retiring a model (within its load
deadline, in threads that cannot hold the server), the repository folder it follows, and each
model's drift monitor."""
