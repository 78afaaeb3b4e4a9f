"""An lm-evaluation-harness backend over a run workdir, memory carried across chunks."""
