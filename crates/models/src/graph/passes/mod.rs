//! Rewrites of the graph that keep its outputs.
