"""OpenAI's API on a route: the request and answer shapes, the routes a replica answers, and a key's LoRA
adapters on one base."""
