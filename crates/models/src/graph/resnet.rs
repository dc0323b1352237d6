//! gpukit's ResNet as a graph.
