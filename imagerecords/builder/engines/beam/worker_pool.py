"""Beam's SDK worker pool, for the sidecar beside each Flink TaskManager (docs/flink.md).

    python -m imagerecords.builder.engines.beam.worker_pool [--host ADDRESS] [--port 50000] [--warm]

Without --warm it is Beam's own pool (what the SDK image's boot program runs with --worker_pool):
each SDK worker a TaskManager asks for is a fresh `python` process, which imports Beam and the
project again (~24 per job of ours). With --warm every SDK worker is a thread of this process,
which has imported them once: a job's workers start at once, but share one GIL per pool, so keep
process workers where a TaskManager's slots are busy with Python work for long.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m imagerecords.builder.engines.beam.worker_pool",
                                     description="Serve Beam SDK workers to the Flink TaskManager beside this pool.")
    parser.add_argument("--host", default="[::]", help="address to listen on (default: every address, as Beam's pool)")
    parser.add_argument("--port", type=int, default=50000,
                        help="port of --environment_config=HOST:PORT (default 50000; 0 picks one, logged)")
    parser.add_argument("--warm", action="store_true",
                        help="run SDK workers as threads of this process, which has Beam and imagerecords imported")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)

    # Beam and grpc: 1.2 s to import; after the arguments, so --help and a bad flag answer at once
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer
    from apache_beam.utils import thread_pool_executor

    if args.warm:
        # What each thread worker runs, and the pipeline's code every worker unpickles: imported once.
        for module in ("apache_beam.runners.worker.sdk_worker_main", "imagerecords.transforms"):
            importlib.import_module(module)
        logging.info("warm worker pool: SDK workers run as threads")
    # Beam's worker_pool_main binds [::]:PORT only; a given address lets pools share a port on one host.
    server = grpc.server(thread_pool_executor.shared_unbounded_instance(), options=[("grpc.so_reuseport", 0)])
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(
        BeamFnExternalWorkerPoolServicer(use_process=not args.warm, data_buffer_time_limit_ms=-1), server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    if port == 0:
        print(f"worker pool: cannot listen on {args.host}:{args.port}", file=sys.stderr)
        return 1
    server.start()
    logging.info("worker pool listening on %s:%d", args.host, port)
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
