-- wrk script: POST /out with the body mailqueuer sends for an authenticated message to an
-- external recipient (three keys counted: A, D, O).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-token"
wrk.body = '{"trace_id":"bench","auth_user":"u@bench.example","mail_from":"u@bench.example","recipient":"r@gmail.com"}'
