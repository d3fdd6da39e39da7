"""The project's own local Spark servers for `make dev`, the tests and the benchmarks, from the pyspark wheel alone: a
standalone cluster (`cluster`: a master and its workers) and a Spark Connect server (`connect_server`)."""
