"""A row softmax in Triton, tuned through its adapter (:mod:`examples.row_softmax.adapter`)."""
