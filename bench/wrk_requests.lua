-- wrk_requests.lua: replay a list of prepared requests, picked at random, and count the HTTP
-- statuses of the answers (printed by done() as "STATUS <code> <count>" lines, which
-- bench/run_bench.py parses: a benchmark of 401s or 422s is worthless, so it checks them).
--
-- usage: wrk -t1 -c16 -d10s --latency -s bench/wrk_requests.lua http://127.0.0.1:PORT \
--            -- REQUESTS_FILE [BODY_FILE]
--
-- REQUESTS_FILE: one request per line, "METHOD<TAB>PATH<TAB>TOKEN", TOKEN "-" for none (else it
-- is sent as "Authorization: Bearer TOKEN"). BODY_FILE: the JSON body of every POST.
-- The same script drives our service and the reference app, so the client does the same work
-- on both sides; every request is formatted once, in init(), not per request.

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

local prepared = {}

function init(args)
  local body = nil
  if args[2] then
    local f = assert(io.open(args[2], "rb"))
    body = f:read("*a")
    f:close()
  end
  for line in io.lines(args[1]) do
    local method, path, token = line:match("^(%S+)\t(%S+)\t(%S+)$")
    if method then
      local headers = {}
      local payload = nil
      if token ~= "-" then
        headers["Authorization"] = "Bearer " .. token
      end
      if method == "POST" then
        headers["Content-Type"] = "application/json"
        payload = body
      end
      prepared[#prepared + 1] = wrk.format(method, path, headers, payload)
    end
  end
  assert(#prepared > 0, "no requests in " .. tostring(args[1]))
  statuses = {} -- a global: done() reads it from every thread with thread:get
  math.randomseed(os.time() + math.floor(os.clock() * 1e6))
end

function request()
  return prepared[math.random(#prepared)]
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("statuses") or {}) do
      total[status] = (total[status] or 0) + count
    end
  end
  for status, count in pairs(total) do
    io.write(string.format("STATUS %d %d\n", status, count))
  end
end
