"""TorchScript on CUDA (recipe `torchscript: {device: cuda}`, contract section 11): the scripted module on the GPU,
one CUDA graph per named shape. Reached only through the torchscript backend's descriptor, runner and stage, which
read the artifact's `device` fact; it needs a CUDA build of torch and nothing else (no TVM, no TensorRT)."""
