-- wrk script for bench/ingest.py: every request carries NEW checkpoint.saved events.
--
--   wrk -t1 -c8 -d25s --timeout 60s -s bench/ingest.lua http://127.0.0.1:8077 -- \
--       target=lifeboat token=lb_... runs=run-0,run-1 batch=1 nonce=0123abcd-a1b2c3 step_base=0
--
-- target=lifeboat  POST /api/v1/events, one event or {"events": [...]} (expects 202)
-- target=mlflow    POST /api/2.0/mlflow/runs/log-batch, runs= are MLflow run ids
--                  (expects 200); one event = metrics loss and lr at its step plus
--                  four tags: location, step, and each file's size and sha256.
-- batch=N          events per request; mix=1 spreads one Lifeboat batch over all runs
--                  (default: a batch is one run's events, like one job's client).
--
-- Event ids are UUIDs made of the phase nonce, the wrk thread and a per-thread counter,
-- so no two requests of a run of bench/ingest.py ever repeat an id (a repeat would be
-- an idempotent no-op). Steps are unique too: step_base + counter * threads + thread.
-- done() prints one line "BENCHJSON {...}" that bench/ingest.py reads.

local threads = {}
local thread_count = 0

function setup(thread)
  thread:set("tid", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

local opts = {}
local runs = {}
local counter = 0
local requests_made = 0
local sha_prefix = ""
local path, expected, batch, mix, nthreads

-- Globals read back by done() through thread:get().
ok = 0
bad = 0
sent = 0
first_bad = ""

function init(args)
  for _, arg in ipairs(args) do
    local k, v = string.match(arg, "^([%w_]+)=(.*)$")
    if k then
      opts[k] = v
    end
  end
  for run in string.gmatch(opts.runs or "run-0", "[^,]+") do
    table.insert(runs, run)
  end
  batch = tonumber(opts.batch or "1")
  mix = opts.mix == "1"
  nthreads = tonumber(opts.threads or "1")
  math.randomseed(os.time() + 7919 * tid)
  local parts = {}
  for i = 1, 7 do
    parts[i] = string.format("%08x", math.random(0, 2147483647))
  end
  sha_prefix = table.concat(parts)
  if opts.target == "mlflow" then
    path = "/api/2.0/mlflow/runs/log-batch"
    expected = 200
    wrk.headers["Content-Type"] = "application/json"
  else
    path = "/api/v1/events"
    expected = 202
    wrk.headers["Content-Type"] = "application/json"
    wrk.headers["Authorization"] = "Bearer " .. opts.token
  end
  wrk.method = "POST"
end

local nonce_a, nonce_b

local function next_event()
  -- One new event: (unique id, step, derived numbers).
  local n = counter
  counter = counter + 1
  local seq = n * nthreads + tid
  local step = tonumber(opts.step_base or "0") + seq
  if not nonce_a then
    nonce_a, nonce_b = string.match(opts.nonce, "^(%x+)-(%x+)$")
  end
  local id = string.format(
    "%s-%04x-4%s-8%s-%012x", nonce_a, tid, string.sub(nonce_b, 1, 3), string.sub(nonce_b, 4, 6), n
  )
  return id, step, seq
end

local function iso_now()
  return os.date("!%Y-%m-%dT%H:%M:%SZ")
end

local function lifeboat_event(run_index, now)
  local id, step, seq = next_event()
  local run = runs[run_index]
  local loss = 2.5 / (1 + step * 0.0001) + (seq % 97) * 0.0001
  local lr = 0.0003 * (0.999 ^ (seq % 1000))
  return string.format(
    '{"id":"%s","type":"checkpoint.saved","run":"%s","time":"%s","step":%.0f,'
      .. '"epoch":%.0f,"location":"/data/ckpt/%s/step-%.0f.pt","files":['
      .. '{"path":"model.pt","size":%.0f,"sha256":"%s%08x"},'
      .. '{"path":"optimizer.pt","size":%.0f,"sha256":"%s%08x"}],'
      .. '"save_seconds":%.3f,"metrics":{"loss":%.6f,"lr":%.8g},"format":"torch"}',
    id, run, now, step, math.floor(step / 1000), run, step,
    1400000000 + (seq % 1000), sha_prefix, seq % 2147483647,
    2800000000 + (seq % 1000), sha_prefix, (seq + 1) % 2147483647,
    1.5 + (seq % 10) * 0.1, loss, lr
  )
end

local function mlflow_parts(run, ts)
  local _, step, seq = next_event()
  local loss = 2.5 / (1 + step * 0.0001) + (seq % 97) * 0.0001
  local lr = 0.0003 * (0.999 ^ (seq % 1000))
  local location = string.format("/data/ckpt/%s/step-%.0f.pt", run, step)
  local metrics = string.format(
    '{"key":"loss","value":%.6f,"timestamp":%.0f,"step":%.0f},'
      .. '{"key":"lr","value":%.8g,"timestamp":%.0f,"step":%.0f}',
    loss, ts, step, lr, ts, step
  )
  local tags = string.format(
    '{"key":"checkpoint.%.0f.location","value":"%s"},'
      .. '{"key":"checkpoint.%.0f.step","value":"%.0f"},'
      .. '{"key":"checkpoint.%.0f.model.pt","value":"size=%.0f sha256=%s%08x"},'
      .. '{"key":"checkpoint.%.0f.optimizer.pt","value":"size=%.0f sha256=%s%08x"}',
    step, location, step, step,
    step, 1400000000 + (seq % 1000), sha_prefix, seq % 2147483647,
    step, 2800000000 + (seq % 1000), sha_prefix, (seq + 1) % 2147483647
  )
  return metrics, tags
end

function request()
  local r = requests_made
  requests_made = requests_made + 1
  sent = sent + 1
  local base_run = ((r * nthreads + tid) % #runs) + 1
  local body
  if opts.target == "mlflow" then
    -- MLflow's log-batch is for one run; the run plays the part of Lifeboat's run key.
    local ts = os.time() * 1000
    local metrics, tags = {}, {}
    for i = 1, batch do
      metrics[i], tags[i] = mlflow_parts(runs[base_run], ts)
    end
    body = '{"run_id":"' .. runs[base_run] .. '","metrics":[' .. table.concat(metrics, ",")
      .. '],"tags":[' .. table.concat(tags, ",") .. "]}"
  else
    local now = iso_now()
    if batch == 1 then
      body = lifeboat_event(base_run, now)
    else
      local events = {}
      for i = 1, batch do
        local run_index = base_run
        if mix then
          run_index = ((base_run + i - 2) % #runs) + 1
        end
        events[i] = lifeboat_event(run_index, now)
      end
      body = '{"events":[' .. table.concat(events, ",") .. "]}"
    end
  end
  return wrk.format(nil, path, nil, body)
end

function response(status, headers, body)
  if status == expected then
    ok = ok + 1
  else
    bad = bad + 1
    if first_bad == "" then
      first_bad = tostring(status) .. " " .. string.sub(body or "", 1, 300)
    end
  end
end

local function json_string(s)
  s = string.gsub(s, '[%c"\\]', function(c)
    return string.format("\\u%04x", string.byte(c))
  end)
  return '"' .. s .. '"'
end

function done(summary, latency, requests)
  local total_ok, total_bad, total_sent, bad_sample = 0, 0, 0, ""
  for _, thread in ipairs(threads) do
    total_ok = total_ok + (thread:get("ok") or 0)
    total_bad = total_bad + (thread:get("bad") or 0)
    total_sent = total_sent + (thread:get("sent") or 0)
    local sample = thread:get("first_bad") or ""
    if bad_sample == "" then
      bad_sample = sample
    end
  end
  local e = summary.errors
  io.write(
    string.format(
      "BENCHJSON {\"duration_us\":%.0f,\"requests\":%.0f,\"ok\":%.0f,\"bad\":%.0f,"
        .. "\"sent\":%.0f,\"p50_us\":%.0f,\"p90_us\":%.0f,\"p99_us\":%.0f,\"max_us\":%.0f,"
        .. "\"mean_us\":%.0f,\"connect_errors\":%.0f,\"read_errors\":%.0f,"
        .. "\"write_errors\":%.0f,\"status_errors\":%.0f,\"timeouts\":%.0f,"
        .. "\"first_bad\":%s}\n",
      summary.duration, summary.requests, total_ok, total_bad, total_sent,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
      latency.mean, e.connect, e.read, e.write, e.status, e.timeout, json_string(bad_sample)
    )
  )
end
