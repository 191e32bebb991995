"""onnxtrain with other tools: Dask data parallelism (:mod:`.distributed`)
and MLflow logging (:mod:`.mlflow`); each imports its tool when used."""
