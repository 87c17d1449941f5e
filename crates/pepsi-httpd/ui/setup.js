// The setup page of pepsi-httpd. Without an administrator: makes the first one (POST
// /api/setup/admin) and reloads into the interview. With a session: shows the parts of the
// interview the radio buttons choose, posts the answers as one JSON document to POST
// /api/setup/tasks (a refused answer is shown beside its field), and follows every task's
// progress from GET /api/setup/tasks until none is pending or running, and checks a mail
// domain's DNS records (GET /api/setup/dns-check) on demand. Text from the server
// is only ever set as textContent.
'use strict';

(() => {
  const byId = (id) => document.getElementById(id);
  const value = (id) => (byId(id) ? byId(id).value.trim() : '');
  const checked = (name) => {
    const el = document.querySelector(`input[name="${name}"]:checked`);
    return el ? el.value : '';
  };

  async function send(url, body, csrf) {
    const headers = { 'Content-Type': 'application/json', Accept: 'application/json' };
    if (csrf) headers['X-CSRF-Token'] = csrf;
    const r = await fetch(url, {
      method: 'POST',
      credentials: 'same-origin',
      headers,
      body: JSON.stringify(body),
    });
    const answer = await r.json().catch(() => ({}));
    return { r, answer };
  }

  function firstAdmin() {
    const form = byId('admin-form');
    const message = byId('admin-message');
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      byId('admin-submit').disabled = true;
      message.textContent = '';
      try {
        const { r, answer } = await send('/api/setup/admin', {
          name: value('admin-name'),
          password: byId('admin-password').value,
        });
        if (r.ok || r.status === 409) {
          location.reload();
          return;
        }
        message.textContent = answer.error || `HTTP ${r.status}`;
      } catch (e) {
        message.textContent = `the server did not answer: ${e.message}`;
      } finally {
        byId('admin-submit').disabled = false;
      }
    });
  }

  function showChosen() {
    for (const div of document.querySelectorAll('[data-when]')) {
      const [name, wanted] = div.dataset.when.split('=');
      div.hidden = !wanted.split('|').includes(checked(name));
    }
  }

  function answers() {
    const a = {
      hostname: value('hostname'),
      domains: value('domains').split(/[\s,]+/).filter((d) => d),
      dkim: { selector: value('dkim-selector'), algorithm: value('dkim-algorithm') },
      mailboxes: [],
    };
    if (checked('certificate') === 'acme') {
      a.certificate = { source: 'acme', email: value('acme-email'), directory: value('acme-directory') };
      if (value('acme-ca-file')) a.certificate.ca_file = value('acme-ca-file');
    } else {
      a.certificate = { source: 'files', certificate: value('tls-certificate'), key: value('tls-key') };
    }
    const relay = checked('relay');
    if (relay === 'smarthost' || relay === 'oauth2') {
      a.relay = {
        mode: 'smarthost',
        server: value('smarthost-server'),
        tls: value('smarthost-tls'),
        username: value('smarthost-username'),
        credential: relay === 'oauth2'
          ? {
            method: 'oauth2',
            token_endpoint: value('oauth-token-endpoint'),
            client_id: value('oauth-client-id'),
            client_secret: byId('oauth-client-secret').value,
            refresh_token: byId('oauth-refresh-token').value,
          }
          : { method: 'password', password: byId('smarthost-password').value },
      };
    } else {
      a.relay = { mode: 'direct' };
    }
    a.delivery = checked('delivery') === 'lmtp'
      ? { method: 'lmtp', server: value('lmtp-server') }
      : { method: 'maildir', root: value('maildir-root') };
    a.features = {
      vacation: byId('feature-vacation').checked,
      whitelist: byId('feature-whitelist').checked,
      language: byId('feature-language').checked,
      encryption: byId('feature-encryption').checked,
    };
    if (value('feature-milter')) a.features.milter = value('feature-milter');
    if (value('mailbox-address')) {
      a.mailboxes.push({ address: value('mailbox-address'), password: byId('mailbox-password').value });
    }
    return a;
  }

  // The page's error slot of an answer field (`mailboxes[0].address` → `mailboxes`).
  function slotOf(field) {
    const base = field.replace(/\[.*$/, '').replace(/\..*$/, '');
    return document.querySelector(`[data-field="${base}"]`) || byId('setup-message');
  }

  function cell(tr, text) {
    const td = document.createElement('td');
    td.textContent = text == null ? '' : String(text);
    tr.appendChild(td);
  }

  function render(tasks) {
    const body = byId('tasks').querySelector('tbody');
    body.replaceChildren();
    const logs = byId('task-logs');
    logs.replaceChildren();
    for (const t of tasks) {
      const tr = document.createElement('tr');
      tr.id = `task-${t.task_id}`;
      tr.className = t.status;
      cell(tr, t.task_id);
      cell(tr, t.kind);
      cell(tr, t.status);
      cell(tr, t.outcome);
      body.appendChild(tr);
      const details = document.createElement('details');
      details.open = t.status === 'running' || t.status === 'failed' || t.status === 'refused';
      const summary = document.createElement('summary');
      summary.textContent = `task ${t.task_id} (${t.kind}): ${t.status}`;
      details.appendChild(summary);
      const pre = document.createElement('pre');
      pre.className = 'task-log';
      pre.textContent = t.log.map((l) => `${l.at.slice(11, 19)} ${l.stream}: ${l.line}`).join('\n');
      details.appendChild(pre);
      logs.appendChild(details);
    }
    return tasks.some((t) => t.status === 'pending' || t.status === 'running');
  }

  async function follow() {
    try {
      const r = await fetch('/api/setup/tasks', { credentials: 'same-origin', headers: { Accept: 'application/json' } });
      if (r.status === 401) {
        location.reload();
        return;
      }
      const answer = await r.json();
      if (render(answer.tasks || [])) setTimeout(follow, 1000);
    } catch (e) {
      byId('setup-message').textContent = `the server did not answer: ${e.message}`;
      setTimeout(follow, 3000);
    }
  }

  const KIND = { mx: 'MX', spf: 'SPF', dkim: 'DKIM', dmarc: 'DMARC', 'mta-sts': 'MTA-STS', 'tls-rpt': 'TLS-RPT', address: 'address', ptr: 'PTR' };

  function dnsCheck() {
    const form = byId('check-form');
    const message = byId('check-message');
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      message.textContent = 'looking up…';
      byId('check-submit').disabled = true;
      const body = byId('dns-checks').querySelector('tbody');
      body.replaceChildren();
      try {
        const r = await fetch(`/api/setup/dns-check?domain=${encodeURIComponent(value('check-domain'))}`, {
          credentials: 'same-origin',
          headers: { Accept: 'application/json' },
        });
        const answer = await r.json().catch(() => ({}));
        if (!r.ok) {
          message.textContent = answer.error || `HTTP ${r.status}`;
          return;
        }
        for (const c of answer.checks) {
          const tr = document.createElement('tr');
          tr.className = c.status;
          tr.dataset.kind = c.kind;
          cell(tr, KIND[c.kind] || c.kind);
          cell(tr, `${c.name} ${c.type}`);
          cell(tr, c.status);
          cell(tr, c.found.join('\n'));
          cell(tr, c.publish ? `${c.reason}\n${c.publish}` : c.reason);
          body.appendChild(tr);
        }
        const bad = answer.checks.filter((c) => c.status !== 'ok').length;
        message.textContent = bad === 0
          ? `every record of ${answer.domain} is as it should be`
          : `${bad} record(s) of ${answer.domain} to fix`;
      } catch (e) {
        message.textContent = `the server did not answer: ${e.message}`;
      } finally {
        byId('check-submit').disabled = false;
      }
    });
  }

  function wizard() {
    const main = byId('setup');
    const form = byId('setup-form');
    const message = byId('setup-message');
    for (const radio of form.querySelectorAll('input[type="radio"]')) {
      radio.addEventListener('change', showChosen);
    }
    showChosen();
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      for (const slot of document.querySelectorAll('.field-error')) slot.textContent = '';
      message.textContent = '';
      byId('setup-submit').disabled = true;
      try {
        const { r, answer } = await send('/api/setup/tasks', answers(), main.dataset.csrf);
        if (r.status === 401) {
          location.reload();
          return;
        }
        if (r.status === 422 && Array.isArray(answer.fields)) {
          for (const f of answer.fields) {
            const slot = slotOf(f.field);
            slot.textContent = `${slot.textContent} ${f.field}: ${f.reason}`.trim();
          }
          message.textContent = 'Some answers are refused: see beside each field.';
          return;
        }
        if (!r.ok) {
          message.textContent = answer.error || `HTTP ${r.status}`;
          return;
        }
        message.textContent = `${answer.tasks.length} tasks written; pepsi-setup apply carries them out.`;
        follow();
      } catch (e) {
        message.textContent = `the server did not answer: ${e.message}`;
      } finally {
        byId('setup-submit').disabled = false;
      }
    });
    follow();
  }

  document.addEventListener('DOMContentLoaded', () => {
    if (byId('admin-form')) firstAdmin();
    if (byId('setup-form')) wizard();
    if (byId('check-form')) dnsCheck();
  });
})();
