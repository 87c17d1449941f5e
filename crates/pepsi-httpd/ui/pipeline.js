// The live pipeline page of pepsi-httpd. The server draws the graph (an SVG whose figures
// are elements with data-field); this script polls GET /api/pipeline every few seconds and
// writes the new figures in place, fetches the picture again (GET /pipeline/graph) when
// the graph itself changed, lists a stage's rows (GET /api/queue?stage=) when the stage is
// clicked, and a row's state and history (GET /api/queue/{id}, /api/events,
// /api/mail-log) when the row is, with links to the row's journey (/journey?queue=), and
// rewrites the stages' pass times (the document's `latency`). Text from the server is only
// ever set as textContent.
'use strict';

(() => {
  const main = document.getElementById('pipeline');
  const csrf = main.dataset.csrf;
  const refresh = Math.max(1000, Number(main.dataset.refreshMs) || 3000);
  const byId = (id) => document.getElementById(id);
  let graphId = byId('pipeline-graph') ? byId('pipeline-graph').dataset.graph : '';
  let openStage = null;
  let openRow = null;

  async function get(url, { allow404 = false } = {}) {
    const r = await fetch(url, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
    if (r.status === 401) {
      // The session ended: the page answers with the login form now.
      location.reload();
      throw new Error('the session has ended');
    }
    if (allow404 && r.status === 404) return null;
    const answer = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(answer.error || `HTTP ${r.status}`);
    return answer;
  }

  function cell(tr, text, className) {
    const td = document.createElement('td');
    td.textContent = text == null ? '' : String(text);
    if (className) td.className = className;
    tr.appendChild(td);
    return td;
  }

  function journeyLink(id) {
    const a = document.createElement('a');
    a.href = `/journey?queue=${encodeURIComponent(id)}`;
    a.className = 'journey';
    a.textContent = 'journey';
    return a;
  }

  // Milliseconds as crate::latency::show_ms writes them.
  function ms(v) {
    if (v == null) return '';
    if (v < 10) return `${v.toFixed(2)} ms`;
    if (v < 100) return `${v.toFixed(1)} ms`;
    if (v < 1000) return `${v.toFixed(0)} ms`;
    if (v < 60000) return `${(v / 1000).toFixed(2)} s`;
    if (v < 3600000) return `${(v / 60000).toFixed(1)} min`;
    return `${(v / 3600000).toFixed(1)} h`;
  }

  function updateLatency(latency) {
    if (!latency) return;
    const stages = latency.stages || [];
    byId('latency-table').tBodies[0].replaceChildren(...stages.map((s) => {
      const tr = document.createElement('tr');
      tr.dataset.stage = s.stage;
      cell(tr, s.stage);
      cell(tr, s.passes);
      cell(tr, ms(s.p50_ms));
      cell(tr, ms(s.p90_ms));
      cell(tr, ms(s.p99_ms));
      cell(tr, s.interrupted);
      return tr;
    }));
    byId('latency-note').textContent = latency.error
      || (stages.length === 0
        ? 'No stage pass in the window: the hosts export no traces, or pepsi-telemetry is not running.'
        : '');
  }

  function age(seconds) {
    if (seconds == null) return '';
    const s = Math.max(0, Math.floor(seconds));
    if (s < 120) return `${s}s`;
    if (s < 7200) return `${Math.floor(s / 60)}m`;
    if (s < 172800) return `${Math.floor(s / 3600)}h`;
    return `${Math.floor(s / 86400)}d`;
  }

  function setStatus(text, bad) {
    const el = byId('updated');
    el.textContent = text;
    el.classList.toggle('bad', bad);
  }

  function field(stage, path) {
    return path.split('.').reduce((v, k) => (v == null ? undefined : v[k]), stage);
  }

  function update(doc) {
    for (const stage of doc.stages) {
      const g = byId(`stage-${stage.name}`);
      if (!g) continue;
      for (const el of g.querySelectorAll('[data-field]')) {
        const v = field(stage, el.dataset.field);
        el.textContent = v == null ? '0' : String(v);
      }
      g.classList.toggle('failing', stage.failures.rows > 0);
      g.classList.toggle('busy', stage.queue.total > 0);
    }
    byId('total-rows').textContent = doc.totals.rows;
    byId('failed-rows').textContent = doc.totals.failed_rows;
    byId('window').textContent = doc.window_seconds;
    byId('span').textContent = Math.round(doc.throughput_seconds);
    updateLatency(doc.latency);
    const list = byId('problems');
    list.replaceChildren(...doc.problems.map((p) => {
      const li = document.createElement('li');
      li.textContent = p;
      return li;
    }));
  }

  async function redraw() {
    const r = await fetch('/pipeline/graph', { credentials: 'same-origin' });
    if (!r.ok) throw new Error(`the graph: HTTP ${r.status}`);
    byId('graph').innerHTML = await r.text();
    graphId = byId('pipeline-graph').dataset.graph;
    markOpen();
  }

  function markOpen() {
    for (const g of document.querySelectorAll('g.stage')) {
      g.classList.toggle('open', g.dataset.stage === openStage);
    }
  }

  async function loadRows(stage) {
    const list = await get(`/api/queue?stage=${encodeURIComponent(stage)}&limit=100`);
    const section = byId('rows');
    section.hidden = false;
    byId('rows-stage').textContent = stage;
    const shown = list.rows.length;
    byId('rows-count').textContent = list.truncated
      ? `${list.summary.total} rows, the oldest ${shown} shown`
      : `${list.summary.total} rows`;
    const body = byId('rows-table').tBodies[0];
    body.replaceChildren(...list.rows.map((row) => {
      const tr = document.createElement('tr');
      tr.className = 'row';
      tr.dataset.id = row.id;
      tr.tabIndex = 0;
      if (String(row.id) === String(openRow)) tr.classList.add('selected');
      cell(tr, row.id);
      cell(tr, row.display_status, `status ${row.display_status}`);
      cell(tr, row.mail_from || '<>');
      cell(tr, row.rcpt_to.join(', '));
      cell(tr, age(row.age_seconds));
      cell(tr, row.attempts);
      cell(tr, row.last_error || row.dispatch_error, 'error');
      cell(tr, '').appendChild(journeyLink(row.id));
      return tr;
    }));
  }

  async function openStageRows(stage) {
    openStage = stage;
    markOpen();
    try {
      await loadRows(stage);
      byId('rows').scrollIntoView({ block: 'nearest' });
    } catch (e) {
      byId('rows').hidden = false;
      byId('rows-stage').textContent = stage;
      byId('rows-count').textContent = `cannot list the rows: ${e.message}`;
      byId('rows-table').tBodies[0].replaceChildren();
    }
  }

  function fact(dl, name, value) {
    if (value == null || value === '') return;
    const dt = document.createElement('dt');
    dt.textContent = name;
    const dd = document.createElement('dd');
    dd.textContent = Array.isArray(value) ? value.join(', ') : String(value);
    dl.append(dt, dd);
  }

  async function showRow(id) {
    openRow = id;
    for (const tr of document.querySelectorAll('#rows-table tr.row')) {
      tr.classList.toggle('selected', tr.dataset.id === String(id));
    }
    const section = byId('detail');
    section.hidden = false;
    byId('detail-id').textContent = id;
    byId('detail-journey').href = `/journey?queue=${encodeURIComponent(id)}`;
    const [row, events, log] = await Promise.all([
      get(`/api/queue/${encodeURIComponent(id)}`, { allow404: true }),
      get(`/api/events?workqueue_id=${encodeURIComponent(id)}&limit=100`),
      get(`/api/mail-log?workqueue_id=${encodeURIComponent(id)}&limit=100`),
    ]);
    const dl = byId('detail-facts');
    dl.replaceChildren();
    if (row === null) {
      fact(dl, 'now', 'no longer in the queue (finished or removed): its history is below');
      byId('detail-state').textContent = '';
      byId('detail-headers').textContent = '';
    } else {
      fact(dl, 'stage', row.stage);
      fact(dl, 'status', row.display_status);
      fact(dl, 'sender', row.mail_from || '<>');
      fact(dl, 'recipients', row.rcpt_to);
      fact(dl, 'received', row.received_at);
      fact(dl, 'updated', row.updated_at);
      fact(dl, 'age', age(row.age_seconds));
      fact(dl, 'attempts', row.attempts);
      fact(dl, 'next retry', row.next_retry);
      fact(dl, 'last error', row.last_error);
      fact(dl, 'dispatch error', row.dispatch_error);
      fact(dl, 'authenticated as', row.auth_user);
      fact(dl, 'client', row.client_addr);
      fact(dl, 'body size', row.body_size);
      byId('detail-state').textContent = JSON.stringify(row.state, null, 2);
      byId('detail-headers').textContent = row.headers;
    }
    byId('detail-events').tBodies[0].replaceChildren(...events.events.map((ev) => {
      const tr = document.createElement('tr');
      cell(tr, ev.at);
      cell(tr, ev.actor);
      cell(tr, ev.action);
      cell(tr, JSON.stringify(ev.detail), 'json');
      return tr;
    }));
    byId('detail-mail-log').tBodies[0].replaceChildren(...log.entries.map((en) => {
      const tr = document.createElement('tr');
      cell(tr, en.at);
      cell(tr, en.stage);
      cell(tr, en.event);
      cell(tr, JSON.stringify(en.detail), 'json');
      const td = cell(tr, '');
      if (en.workqueue_id != null) td.appendChild(journeyLink(en.workqueue_id));
      return tr;
    }));
  }

  function onActivate(container, selector, act) {
    const handler = (event) => {
      if (event.type === 'keydown' && event.key !== 'Enter' && event.key !== ' ') return;
      // A link inside a row (its journey) is followed, not taken for a click on the row.
      if (event.target.closest('a')) return;
      const target = event.target.closest(selector);
      if (!target || !container.contains(target)) return;
      event.preventDefault();
      act(target);
    };
    container.addEventListener('click', handler);
    container.addEventListener('keydown', handler);
  }

  onActivate(byId('graph'), 'g.stage', (g) => openStageRows(g.dataset.stage));
  onActivate(byId('rows-table'), 'tr.row', (tr) => showRow(tr.dataset.id).catch((e) => {
    byId('detail-facts').textContent = `cannot show the row: ${e.message}`;
  }));

  const logout = byId('logout');
  if (logout) {
    logout.addEventListener('click', async () => {
      await fetch('/api/logout', {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'X-CSRF-Token': csrf },
      }).catch(() => null);
      location.assign('/login');
    });
  }

  async function poll() {
    try {
      const doc = await get('/api/pipeline');
      if (doc.graph_id !== graphId) await redraw();
      update(doc);
      if (openStage !== null) await loadRows(openStage);
      setStatus(`as of ${new Date(doc.generated_at).toLocaleTimeString()}`, false);
    } catch (e) {
      setStatus(`not updated: ${e.message}`, true);
    } finally {
      setTimeout(poll, refresh);
    }
  }
  setTimeout(poll, refresh);
})();
