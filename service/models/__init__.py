"""The models a server holds: the registry, loading and retiring a model, the repository
folder it follows, and each model's drift monitor."""
