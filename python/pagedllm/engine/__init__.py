"""The engine: requests and sequences, the scheduler, the model runner, the sampler."""
