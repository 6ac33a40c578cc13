"""What the torch-based plug-ins share (torch, Lightning, RLlib, transformers): ``TorchBackend``, the
torch worker loop, array batches, optimizers and LR schedulers, the step's settings, FSDP."""
