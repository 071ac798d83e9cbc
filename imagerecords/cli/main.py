"""The `imagerecords` command: build, verify, inspect and demo."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time
import warnings
from typing import List, Optional, Sequence

from imagerecords import __version__

USAGE = """imagerecords COMMAND [ARGS]

commands:
  build    build a sharded TFRecord dataset (imagerecords build --help)
  finish   publish a build whose launcher did not commit it (a Dataflow template, a cut commit)
  verify   check the shards against manifest.json (--records: every record's CRC too)
  inspect  print a dataset's splits, shards, labels and features (--spec tf|tfrecord|dali: a reader's parse spec;
           --files SPLIT: the current shard paths, one a line; --glob SPLIT: the glob matching exactly them)
  report   write an HTML page showing a dataset: sample images per class, histograms, rejects
  demo     generate a small image tree and build it (the README's first command)

Exit codes: 0 ok, 1 the build failed or verify found problems, 2 bad usage, 3 input problem,
4 output problem, 5 output locked (by another build, or an unreadable lock file), 6 reject budget
exceeded, 7 unfinished build.
"""


def verify(output: str, records: bool = False) -> List[str]:
    """Returns the problems found comparing `output` with its manifest (none = [])."""
    # each command imports its own modules when it runs: --help imports none of them (11 ms in all)
    from imagerecords.cli import inspection

    return inspection.verify(output, records)[0]


def _demo(argv: Sequence[str]) -> int:
    # the command's own modules: see verify()
    from imagerecords.pipeline import example_images
    from imagerecords.cli.launcher import run

    p = argparse.ArgumentParser(prog="imagerecords demo", description="Generate example images and build them.")
    p.add_argument("output", nargs="?", default="example_output", help="folder for images/ and dataset/ (default: example_output)")
    known, beam_args = p.parse_known_args(argv)
    images = os.path.join(known.output, "images")
    dataset = os.path.join(known.output, "dataset")
    example_images.write_tree(images, per_class=16, broken=True)
    print(f"imagerecords demo: wrote {sum(1 for _ in _walk(images))} example images (one deliberately truncated) to {images}")
    run(["--input", images, "--output", dataset, "--splits", "train=0.75,validation=0.25", "--overwrite",
         "--max_reject_fraction", "0.05", *beam_args])
    print(f"read it back:  python -c \"from imagerecords import reader; print(reader.load_info('{dataset}'))\"")
    return 0


def _walk(root: str):
    for dirpath, _, files in os.walk(root):
        yield from (os.path.join(dirpath, f) for f in files)


def _quiet_libraries() -> None:
    """Keeps library start-up chatter off the user's terminal: TensorFlow's C++ info logs and the
    Google client libraries' FutureWarnings about Python and grpcio support dates, which Beam's
    GCP extras trigger on import. Real warnings and errors still show. Also keeps OpenBLAS's
    idle threads off the cores the build's workers use."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # No command does linear algebra: OpenBLAS's threads would spin 80 ms of a core from numpy's import on.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.")
    # Local worker processes inherit this (their warnings cannot be filtered by module here).
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    # The local job service relays every worker's start-up notices at WARNING; errors still show.
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.ERROR)


# The one switch each single-folder command takes, and its --help line.
_SWITCHES = {
    "finish": ("--break_lock", "take over the folder's lock even if its holder may still be running (use only when "
                               "no build or finish is writing there any more)"),
    "verify": ("--records", "also read every record: both CRCs of each frame, the record counts, and each "
                            "record against the manifest's feature spec (reads every byte; slower)"),
}


def _one_folder(command: str, rest: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"imagerecords {command}")
    p.add_argument("output", help="the dataset folder (local or gs://...)")
    flag, text = _SWITCHES[command]
    p.add_argument(flag, action="store_true", help=text)
    return p.parse_args(rest)


# Commands that run Beam, and what the `build` extra installs for them (import name: distribution).
_BUILDER_COMMANDS = ("build", "demo", "verify", "finish")
_BUILDER_MODULES = {"apache_beam": "apache-beam", "PIL": "pillow", "yaml": "pyyaml", "deflate": "deflate"}


def _missing_builder_extra(command: str) -> Optional[str]:
    """The one line to print when `command` needs the builder extra and it is not installed (the
    reader-only install has neither Beam nor Pillow); None when all is there."""
    if command not in _BUILDER_COMMANDS:
        return None
    missing = [dist for module, dist in _BUILDER_MODULES.items() if importlib.util.find_spec(module) is None]
    if not missing:
        return None
    return (f"imagerecords {command} needs the builder extra ({', '.join(missing)} not installed): "
            "pip install -e '.[build]' in the imagerecords checkout (or '.[gcp]' for gs://)")


def _command(command: str, rest: Sequence[str]) -> int:
    missing = _missing_builder_extra(command)
    if missing:
        print(missing, file=sys.stderr)
        return 1
    if command == "build":
        # the command's own modules: see verify()
        from imagerecords.cli.launcher import run

        run(rest)
        return 0
    if command == "finish":
        # the command's own modules: see verify()
        from imagerecords.cli.launcher import finish, print_summary

        args = _one_folder(command, rest)
        start = time.monotonic()
        manifest, staged = finish(args.output, args.break_lock)
        print_summary(manifest, args.output, time.monotonic() - start, built=False,
                      failed_hosts=staged.failed_hosts if staged else (), near=staged.near_groups if staged else (0, 0))
        return 0
    if command == "verify":
        # the command's own modules: see verify()
        from imagerecords.cli import inspection

        args = _one_folder(command, rest)
        problems, notes = inspection.verify(args.output, args.records)
        for problem in problems:
            print(problem)
        for note in notes:
            print(f"note: {note}")
        print("ok" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    if command == "inspect":
        # the command's own modules: see verify()
        from imagerecords.cli import inspection

        p = argparse.ArgumentParser(prog="imagerecords inspect")
        p.add_argument("output", help="the dataset folder (local or gs://...)")
        p.add_argument("--spec", choices=("tf", "tfrecord", "dali"), default=None,
                       help="print the records' parse spec for tf.io.parse_example, the PyTorch tfrecord "
                            "package's description, or DALI's fn.readers.tfrecord features, and nothing else")
        lists = p.add_mutually_exclusive_group()
        lists.add_argument("--files", metavar="SPLIT", default=None,
                           help="print the current version's shard paths of SPLIT, one per line, and nothing else")
        lists.add_argument("--glob", metavar="SPLIT", default=None,
                           help="print the glob that matches exactly the current version's shards of SPLIT")
        args = p.parse_args(rest)
        if args.spec and (args.files or args.glob):
            p.error("--spec goes alone, without --files or --glob")
        if args.files:
            print("\n".join(inspection.shard_files(args.output, args.files)))
            return 0
        if args.glob:
            print(inspection.shard_glob(args.output, args.glob))
            return 0
        if args.spec:
            print(inspection.spec(args.output, args.spec))
            return 0
        lines, problems = inspection.inspect(args.output)
        print("\n".join(lines))
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    if command == "report":
        # the command's own modules: see verify()
        from imagerecords.cli import report
        from imagerecords.cli import inspection

        return report.main(rest, load_manifest=inspection.load_for_report)
    if command == "demo":
        return _demo(rest)
    print(f"imagerecords: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    _quiet_libraries()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(f"imagerecords {__version__}")
        return 0
    # after --help and --version, which answer without them (see verify())
    from imagerecords.cli.exit_codes import exit_code
    from imagerecords.pipeline import errors
    from imagerecords.pipeline.naming import flag_names

    command, rest = argv[0], argv[1:]
    try:
        with flag_names():  # the command's messages name settings as its flags
            code = _command(command, rest)
        sys.stdout.flush()  # here, so a closed pipe is caught below and not at exit
        return code
    except BrokenPipeError:
        # Whoever read the output stopped (`inspect OUT | head -3`): no message, as for any pipe tool;
        # stdout goes to /dev/null so the interpreter's last flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # as a process killed by SIGPIPE
    except errors.Interrupted as e:
        print(f"imagerecords {command}: {e}", file=sys.stderr)
        return exit_code(e)
    except errors.BuildError as e:
        print(f"imagerecords {command}: error: {e}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", 2)
        print(f"imagerecords {command}: interrupted", file=sys.stderr)
        return 128 + signum
