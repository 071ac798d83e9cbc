#!/usr/bin/env bash
# Fetch and cache what the Flink integration tests need:
#   * a standalone Apache Flink distribution (JobManager/TaskManager scripts and jars), assembled
#     from the PyPI packages `apache-flink` (bin/ and conf/) and `apache-flink-libraries`
#     (lib/, opt/, plugins/), downloaded with `pip download --no-deps` and never installed;
#   * Beam's Flink job server. Beam publishes no shaded `beam-runners-flink-<minor>-job-server`
#     jar to Maven, so the script writes a small pom depending on the unshaded
#     org.apache.beam:beam-runners-flink-<minor> and beam-runners-java-job-service artifacts,
#     resolves their classpath with `mvn dependency:build-classpath` (the jars stay in the local
#     Maven repository) and writes a "launcher jar": an empty jar whose manifest names
#     org.apache.beam.runners.flink.FlinkJobServerDriver as Main-Class, lists the resolved jars as
#     file: URLs in Class-Path and carries the Add-Opens/Add-Exports Java 17 needs. Beam's
#     FlinkRunner starts it with `java -jar` when given --flink_job_server_jar=<launcher jar>.
#
# Idempotent: everything lands under ${IMAGERECORDS_CACHE:-$HOME/.cache/imagerecords}/flink and is
# reused on later runs (Maven is not run again while every jar of the cached classpath exists).
# On success it prints KEY=VALUE lines that tests/support/flink.py parses.
#
# Environment:
#   FLINK_VERSION                   Flink distribution version (default 1.19.3: Beam 2.62's newest
#                                   Flink runner is for Flink 1.19).
#   BEAM_VERSION                    Beam version of the job server (default: the apache-beam of
#                                   $PYTHON, else 2.62.0). It must match the Python SDK's.
#   BEAM_FLINK_JOB_SERVER_JAR       use this job-server jar instead of resolving one with Maven.
#   IMAGERECORDS_CACHE              cache root (default $HOME/.cache/imagerecords).
#   MAVEN_REPO_LOCAL                local Maven repository (default $HOME/.m2/repository).
#   PYTHON                          interpreter for pip and small helpers (default: the repo's
#                                   .venv, else python3).
#
# Printed keys: FLINK_HOME, FLINK_VERSION, FLINK_MINOR, BEAM_VERSION,
#   BEAM_FLINK_JOB_SERVER_JAR        the jar for --flink_job_server_jar;
#   BEAM_FLINK_JOB_SERVER_CLASSPATH  a file holding the resolved classpath (one ':'-separated line),
#                                    for `java -cp "$(cat FILE)" FlinkJobServerDriver`; empty when
#                                    BEAM_FLINK_JOB_SERVER_JAR was given.
#
# Exit status: 0 when the Flink distribution and the job server are both available;
#              2 when the distribution is ready but the job server could not be obtained
#                (BEAM_FLINK_JOB_SERVER_JAR= is then printed empty);
#              1 on any other failure.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${IMAGERECORDS_CACHE:-$HOME/.cache/imagerecords}"
FLINK_CACHE="$CACHE_ROOT/flink"
FLINK_VERSION="${FLINK_VERSION:-1.19.3}"
FLINK_MINOR="$(echo "$FLINK_VERSION" | cut -d. -f1,2)"

log() { echo "get_flink: $*" >&2; }

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO_ROOT/.venv/bin/python" ]; then
    PYTHON="$REPO_ROOT/.venv/bin/python"
  else
    PYTHON="$(command -v python3 || true)"
  fi
fi
[ -n "$PYTHON" ] || { log "no python found"; exit 1; }

if [ -z "${BEAM_VERSION:-}" ]; then
  BEAM_VERSION="$("$PYTHON" -c 'import apache_beam; print(apache_beam.__version__)' 2>/dev/null \
    || echo 2.62.0)"
fi

mkdir -p "$FLINK_CACHE/downloads"

# --- Flink distribution -------------------------------------------------------------------------
FLINK_HOME="$FLINK_CACHE/flink-$FLINK_VERSION"
if [ ! -f "$FLINK_HOME/.complete" ]; then
  command -v java >/dev/null || { log "java not found on PATH"; exit 1; }
  dl="$FLINK_CACHE/downloads"
  # Older releases name the sdist apache-flink-libraries-*, newer ones apache_flink_libraries-*.
  find_sdist() { ls "$dl"/apache[-_]flink[-_]libraries-"$FLINK_VERSION".tar.gz 2>/dev/null | head -n1 || true; }
  libs_sdist="$(find_sdist)"
  if [ -z "$libs_sdist" ]; then
    log "downloading apache-flink-libraries==$FLINK_VERSION (about 230 MB)"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
      "apache-flink-libraries==$FLINK_VERSION" -d "$dl"
    libs_sdist="$(find_sdist)"
    [ -n "$libs_sdist" ] || { log "apache-flink-libraries==$FLINK_VERSION sdist not found in $dl"; exit 1; }
  fi
  # The wheel is platform specific but only its platform-independent bin/ and conf/ are used, so a
  # fixed platform/interpreter keeps the download the same on every machine.
  wheel="$(ls "$dl"/apache_flink-"$FLINK_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
  if [ -z "$wheel" ]; then
    log "downloading apache-flink==$FLINK_VERSION wheel (bin/ and conf/ only)"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary :all: \
      --platform manylinux2014_x86_64 --python-version 3.11 --implementation cp \
      "apache-flink==$FLINK_VERSION" -d "$dl"
    wheel="$(ls "$dl"/apache_flink-"$FLINK_VERSION"-*.whl | head -n1)"
  fi

  staging="$(mktemp -d "$FLINK_CACHE/.staging.XXXXXX")"
  trap 'rm -rf "$staging"' EXIT
  log "assembling Flink $FLINK_VERSION distribution"
  tar -xzf "$libs_sdist" -C "$staging"
  "$PYTHON" - "$wheel" "$staging/wheel" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf:
    members = [n for n in zf.namelist() if n.startswith(("pyflink/bin/", "pyflink/conf/"))]
    zf.extractall(sys.argv[2], members)
EOF
  home="$staging/flink-$FLINK_VERSION"
  mkdir -p "$home/log"
  deps="$staging/apache-flink-libraries-$FLINK_VERSION/deps"
  [ -d "$deps" ] || deps="$(find "$staging" -maxdepth 2 -type d -name deps | head -n1)"
  for d in lib opt plugins; do cp -r "$deps/$d" "$home/$d"; done
  cp -r "$staging/wheel/pyflink/bin" "$home/bin"
  cp -r "$staging/wheel/pyflink/conf" "$home/conf"
  cp "$deps/bin/"*.jar "$home/bin/"
  # The scripts' helper for pip-installed PyFlink would redirect FLINK_HOME into site-packages.
  rm -f "$home/bin/find_flink_home.py"
  chmod +x "$home/bin/"*.sh "$home/bin/flink"
  ls "$home/lib"/flink-dist-*.jar >/dev/null
  touch "$home/.complete"
  rm -rf "$FLINK_HOME"
  mv "$home" "$FLINK_HOME"
  rm -rf "$staging"
  trap - EXIT
  # The archives are no longer needed once the distribution is unpacked.
  rm -f "$libs_sdist" "$wheel"
fi

# --- Beam Flink job server: a launcher jar over a Maven-resolved classpath ----------------------
JOB_SERVER_JAR=""
JOB_SERVER_CLASSPATH=""
JS_DIR="$FLINK_CACHE/job-server-beam$BEAM_VERSION-flink$FLINK_MINOR"
M2_REPO="${MAVEN_REPO_LOCAL:-$HOME/.m2/repository}"

# True when the cached classpath file exists and every jar it names is still on disk.
classpath_intact() {
  [ -s "$JS_DIR/classpath.txt" ] || return 1
  local jar
  while IFS= read -r jar; do
    [ -z "$jar" ] || [ -f "$jar" ] || return 1
  done < <(tr ':' '\n' < "$JS_DIR/classpath.txt")
}

if [ -n "${BEAM_FLINK_JOB_SERVER_JAR:-}" ]; then
  [ -f "$BEAM_FLINK_JOB_SERVER_JAR" ] || { log "BEAM_FLINK_JOB_SERVER_JAR=$BEAM_FLINK_JOB_SERVER_JAR missing"; exit 1; }
  JOB_SERVER_JAR="$BEAM_FLINK_JOB_SERVER_JAR"
else
  mkdir -p "$JS_DIR"
  if ! classpath_intact; then
    rm -f "$JS_DIR/launcher.jar" "$JS_DIR/classpath.txt"
    if ! command -v mvn >/dev/null; then
      log "mvn not found; cannot resolve Beam's Flink job server"
    else
      # slf4j-jdk14 makes the job server log to stderr, as the shaded job-server jar would.
      cat > "$JS_DIR/pom.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by .ci/get_flink.sh: the runtime classpath of Beam's Flink job server. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.imagerecords</groupId>
  <artifactId>beam-flink-job-server-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.beam</groupId>
      <artifactId>beam-runners-flink-$FLINK_MINOR</artifactId>
      <version>$BEAM_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.apache.beam</groupId>
      <artifactId>beam-runners-java-job-service</artifactId>
      <version>$BEAM_VERSION</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-jdk14</artifactId>
      <version>1.7.30</version>
    </dependency>
  </dependencies>
</project>
EOF
      log "resolving org.apache.beam:beam-runners-flink-$FLINK_MINOR:$BEAM_VERSION and its dependencies with Maven"
      if mvn -B -q -f "$JS_DIR/pom.xml" "-Dmaven.repo.local=$M2_REPO" dependency:build-classpath \
          -Dmdep.includeScope=runtime "-Dmdep.outputFile=$JS_DIR/classpath.txt.tmp" \
          >"$JS_DIR/mvn.log" 2>&1 && [ -s "$JS_DIR/classpath.txt.tmp" ]; then
        mv "$JS_DIR/classpath.txt.tmp" "$JS_DIR/classpath.txt"
      else
        rm -f "$JS_DIR/classpath.txt.tmp"
        log "Beam $BEAM_VERSION's Flink $FLINK_MINOR runner could not be resolved (see $JS_DIR/mvn.log)"
      fi
    fi
  fi

  if classpath_intact; then
    JOB_SERVER_CLASSPATH="$JS_DIR/classpath.txt"
    if [ ! -f "$JS_DIR/launcher.jar" ]; then
      log "writing $JS_DIR/launcher.jar"
      # Manifest lines hold at most 72 bytes; a longer value continues on lines that start with a
      # single space (the JAR File Specification). `jar` reads such a file as it is.
      "$PYTHON" - "$JS_DIR/classpath.txt" "$JS_DIR/MANIFEST.MF" <<'EOF'
import pathlib, sys

jars = [j for j in pathlib.Path(sys.argv[1]).read_text().strip().split(":") if j]
# The --add-opens/--add-exports of Flink's own config.yaml, as attributes `java -jar` honours:
# the job server builds and serializes Flink job graphs (Kryo, closure cleaning) on Java 17.
opens = ["java.base/" + pkg for pkg in (
    "java.lang", "java.net", "java.io", "java.nio", "sun.nio.ch", "java.lang.reflect",
    "java.text", "java.time", "java.util", "java.util.concurrent",
    "java.util.concurrent.atomic", "java.util.concurrent.locks")]
exports = ["java.base/sun.net.util", "java.rmi/sun.rmi.registry",
           "java.security.jgss/sun.security.krb5"]
attributes = [
    ("Manifest-Version", "1.0"),
    ("Main-Class", "org.apache.beam.runners.flink.FlinkJobServerDriver"),
    ("Add-Opens", " ".join(opens)),
    ("Add-Exports", " ".join(exports)),
    ("Class-Path", " ".join(pathlib.Path(j).resolve().as_uri() for j in jars)),
]


def wrap(line: bytes) -> list:
    out = [line[:72]]
    line = line[72:]
    while line:
        out.append(b" " + line[:71])
        line = line[71:]
    return out


lines = [part for name, value in attributes for part in wrap(f"{name}: {value}".encode())]
pathlib.Path(sys.argv[2]).write_bytes(b"\r\n".join(lines) + b"\r\n\r\n")
EOF
      rm -f "$JS_DIR/launcher.jar.tmp"
      if command -v jar >/dev/null; then
        jar --create --file "$JS_DIR/launcher.jar.tmp" --manifest "$JS_DIR/MANIFEST.MF"
      else
        # A JRE without JDK tools: a jar is a zip holding META-INF/MANIFEST.MF.
        "$PYTHON" - "$JS_DIR/MANIFEST.MF" "$JS_DIR/launcher.jar.tmp" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_DEFLATED) as zf:
    zf.write(sys.argv[1], "META-INF/MANIFEST.MF")
EOF
      fi
      mv "$JS_DIR/launcher.jar.tmp" "$JS_DIR/launcher.jar"
    fi
    JOB_SERVER_JAR="$JS_DIR/launcher.jar"
  fi
fi

echo "FLINK_HOME=$FLINK_HOME"
echo "FLINK_VERSION=$FLINK_VERSION"
echo "FLINK_MINOR=$FLINK_MINOR"
echo "BEAM_VERSION=$BEAM_VERSION"
echo "BEAM_FLINK_JOB_SERVER_JAR=$JOB_SERVER_JAR"
echo "BEAM_FLINK_JOB_SERVER_CLASSPATH=$JOB_SERVER_CLASSPATH"
[ -n "$JOB_SERVER_JAR" ] || exit 2
