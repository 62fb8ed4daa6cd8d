-- wrk script: one POST per request, a unique call id and path each time.
-- BENCH_TOKEN, BENCH_SESSIONS (comma-separated), BENCH_TAG (unique per run),
-- BENCH_TARGET ("calls" = the agent API, "insert" = the bare baseline view).
local token = os.getenv("BENCH_TOKEN")
local tag = os.getenv("BENCH_TAG") or "t"
local target = os.getenv("BENCH_TARGET") or "calls"
local sessions = {}
for s in string.gmatch(os.getenv("BENCH_SESSIONS") or "", "[^,]+") do
  table.insert(sessions, s)
end
local n = 0
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}

request = function()
  n = n + 1
  local body = '{"calls":[{"id":"' .. tag .. '-' .. n ..
    '","name":"list_directory","arguments":{"path":"d' .. n .. '"}}]}'
  local path
  if target == "insert" then
    path = "/api/bench/insert"
  else
    path = "/api/v1/sessions/" .. sessions[(n % #sessions) + 1] .. "/calls"
  end
  return wrk.format("POST", path, headers, body)
end
