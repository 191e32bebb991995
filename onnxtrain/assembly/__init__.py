"""Assembly of training graphs from prediction graphs: loading and choosing
weights (:mod:`.models`), rewriting scikit-learn converted graphs
(:mod:`.rewrite`), the training graphs of every path
(:mod:`.training_graphs`) and onnxcustom's gradient helper
(:mod:`.grad_helper`). Builds ModelProtos; runs nothing."""
