// The login form of pepsi-httpd: posts the name and password to POST /api/login (the
// API's own throttling and answers apply) and, once the session cookie is set, opens the
// page that asked for it (the login form stands in for a page whose session is missing)
// or, from /login, the pipeline page.
'use strict';

document.addEventListener('DOMContentLoaded', () => {
  const form = document.getElementById('login-form');
  const message = document.getElementById('login-message');
  const button = document.getElementById('login-submit');
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    button.disabled = true;
    message.textContent = '';
    try {
      const r = await fetch('/api/login', {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
        body: JSON.stringify({
          name: document.getElementById('login-name').value,
          password: document.getElementById('login-password').value,
        }),
      });
      if (r.ok) {
        if (location.pathname === '/login') {
          location.assign('/pipeline');
        } else {
          location.reload();
        }
        return;
      }
      const answer = await r.json().catch(() => ({}));
      message.textContent = answer.error || `the login failed (HTTP ${r.status})`;
    } catch (e) {
      message.textContent = `the server did not answer: ${e.message}`;
    } finally {
      button.disabled = false;
    }
  });
});
