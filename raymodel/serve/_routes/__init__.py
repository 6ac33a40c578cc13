"""Routes of registry versions (the model server): a route's plan, the deployments that answer it (one
version or a split, with a shadow; a key's versions multiplexed), its traffic figures, and the routes
declared on storage that a new head serves again."""
