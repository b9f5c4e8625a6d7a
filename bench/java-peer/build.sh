#!/usr/bin/env bash
# Builds the Java v4 change feed processor peer (one shaded jar, with azure-cosmos from Maven
# Central) when it is missing or older than its sources, and prints the jar's path.
# Needs a JDK (17+) and Maven.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
jar="$PWD/target/java-peer-0.1.0.jar"
if [[ ! -f $jar || pom.xml -nt $jar || -n $(find src -type f -newer "$jar") ]]; then
  for tool in java mvn; do
    command -v "$tool" >/dev/null || { echo "java-peer: $tool is missing (a JDK 17+ and Maven build the peer)" >&2; exit 1; }
  done
  mvn -B -q package -DskipTests >&2
fi
echo "$jar"
