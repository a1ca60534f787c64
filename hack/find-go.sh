# Sourced by the hack/build-*.sh scripts: sets GO to the go binary (GO from the environment,
# else `go` on PATH, else /usr/local/go/bin/go), or exits 2 naming the fix. Needs log().
if [[ -n "${GO:-}" ]]; then
  :
elif command -v go >/dev/null 2>&1; then
  GO=$(command -v go)
elif [[ -x /usr/local/go/bin/go ]]; then
  GO=/usr/local/go/bin/go
else
  log "ERROR: go not found (set GO=/path/to/go)"
  exit 2
fi
