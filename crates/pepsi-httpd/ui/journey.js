// The journey page of pepsi-httpd: the server draws the whole timeline; this script only
// logs out (POST /api/logout with the session's CSRF token), as the pipeline page does.
'use strict';

document.addEventListener('DOMContentLoaded', () => {
  const main = document.getElementById('journey');
  const logout = document.getElementById('logout');
  if (!main || !logout) return;
  logout.addEventListener('click', async () => {
    await fetch('/api/logout', {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'X-CSRF-Token': main.dataset.csrf },
    }).catch(() => null);
    location.assign('/login');
  });
});
