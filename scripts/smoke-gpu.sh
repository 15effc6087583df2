#!/usr/bin/env bash
# End-to-end check of the GPU image on a GPU host (not run in CI: it needs Docker, the NVIDIA
# Container Toolkit, a GPU and access to the Hugging Face hub for the checkpoint).
#
#   scripts/smoke-gpu.sh            build the GPU image, start it, transcribe, tear down
#   SMOKE_PULL=1 scripts/smoke-gpu.sh   pull whisper-serve:gpu from the registry instead
#
# Environment:
#   SMOKE_PULL=1            `docker compose pull` instead of `docker compose build`
#   SMOKE_READY_TIMEOUT=N   seconds to wait for /ready (default 1800: first start downloads
#                           the checkpoint and warms the engine)
#   SMOKE_KEEP=1            leave the service running afterwards
#   WHISPER_PORT, WHISPER_API_KEYS  as in .env (the first key is used when keys are set)
# Exit status 0 only when both the curl and the openai-client transcripts contain the
# expected phrase.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

readonly audio=tests/data/speech/jfk.wav
readonly expected="ask not what your country"

# A value from the environment, else from .env (which docker compose reads too), else $2.
setting() {
    local name=$1 fallback=$2 value=${!1:-}
    if [[ -z "$value" && -f .env ]]; then
        value=$(sed -n "s/^${name}=//p" .env | tail -n 1)
        value=${value%\"}
        value=${value#\"}
    fi
    printf '%s' "${value:-$fallback}"
}

port=$(setting WHISPER_PORT 8000)
base_url="http://127.0.0.1:${port}"
ready_timeout=${SMOKE_READY_TIMEOUT:-1800}
api_key=$(setting WHISPER_API_KEYS "")
api_key=${api_key#[}
api_key=${api_key%%,*}
api_key=${api_key%]}
api_key=${api_key//\"/}
api_key=${api_key:-unused}

log() { printf '[smoke] %s\n' "$*" >&2; }

teardown() {
    local status=$?
    if [[ $status -ne 0 ]]; then
        log "failed; last server log lines:"
        docker compose logs --tail 100 whisper >&2 || true
    fi
    if [[ "${SMOKE_KEEP:-0}" != "1" ]]; then
        docker compose down >&2 || true
    fi
    exit "$status"
}

wait_until_ready() {
    local started=$SECONDS
    local deadline=$((SECONDS + ready_timeout))
    log "waiting up to ${ready_timeout}s for ${base_url}/ready"
    until curl --silent --fail --max-time 5 "${base_url}/ready" > /dev/null; do
        if ((SECONDS >= deadline)); then
            log "not ready after ${ready_timeout}s"
            return 1
        fi
        sleep 5
    done
    log "ready after $((SECONDS - started))s"
}

check_transcript() {
    local how=$1 text=$2
    log "${how}: ${text}"
    if [[ "${text,,}" != *"${expected}"* ]]; then
        log "${how}: transcript lacks '${expected}'"
        return 1
    fi
}

transcribe_with_curl() {
    curl --silent --show-error --fail --max-time 300 \
        -H "Authorization: Bearer ${api_key}" \
        -F "file=@${audio}" -F model=whisper-1 -F response_format=text \
        "${base_url}/v1/audio/transcriptions"
}

transcribe_with_openai_client() {
    OPENAI_BASE_URL="${base_url}/v1" OPENAI_API_KEY="${api_key}" python3 - "$audio" <<'PY'
import sys

from openai import OpenAI

with open(sys.argv[1], "rb") as audio:
    result = OpenAI(timeout=300).audio.transcriptions.create(model="whisper-1", file=audio)
print(result.text)
PY
}

main() {
    command -v docker > /dev/null || { log "docker is required"; exit 2; }
    command -v curl > /dev/null || { log "curl is required"; exit 2; }
    python3 -c "import openai" 2> /dev/null || { log "pip install openai first"; exit 2; }

    if [[ "${SMOKE_PULL:-0}" == "1" ]]; then
        docker compose pull whisper
    else
        docker compose build whisper
    fi
    trap teardown EXIT
    docker compose up -d whisper
    wait_until_ready

    check_transcript curl "$(transcribe_with_curl)"
    check_transcript openai "$(transcribe_with_openai_client)"
    log "passed"
}

main "$@"
