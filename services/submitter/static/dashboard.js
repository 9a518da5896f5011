// trialbus dashboard: live updates over Server-Sent Events. No framework, no build.
// Text from the server is set with textContent; the only HTML taken as HTML is the
// server's own autoescaped fragments (the experiment page's tables, the fleet and the
// queue).
"use strict";
(function () {
  const main = document.querySelector("main");
  const status = document.getElementById("live-status");
  const setStatus = (text) => { if (status) status.textContent = text; };
  const MAX_EVENTS = 50;
  const MAX_LOG_CHARS = 200000;

  // Every live page's stream: the status line says whether it is connected (EventSource
  // reconnects by itself after an error).
  function openStream(url) {
    const source = new EventSource(url);
    source.onopen = () => setStatus("live");
    source.onerror = () => setStatus("reconnecting");
    return source;
  }

  function followExperiment(url) {
    const source = openStream(url);
    source.addEventListener("progress", (e) => {
      const data = JSON.parse(e.data);
      for (const [key, value] of Object.entries(data.progress)) {
        for (const el of document.querySelectorAll(`[data-count="${key}"]`)) {
          el.textContent = String(value);
          if (key === "state") el.className = `state state-${value}`;
        }
      }
      for (const [id, html] of Object.entries(data.sections || {})) {
        const el = document.getElementById(id);
        if (el) el.innerHTML = html;
      }
      // Matrix cells that changed while the matrix kept its shape: each <td> alone.
      for (const [key, html] of Object.entries(data.cells || {})) {
        const el = document.querySelector(`#matrix td[data-cell="${key}"]`);
        if (el) el.outerHTML = html;
      }
      main.dataset.updates = String(Number(main.dataset.updates || "0") + 1);
      const state = data.progress.state;
      if (state === "complete" || state === "cancelled") {
        source.close();
        setStatus(`${state} (live updates ended)`);
      }
    });
    source.addEventListener("trial", (e) => {
      const d = JSON.parse(e.data);
      const list = document.getElementById("live-events");
      const item = document.createElement("li");
      item.textContent = [d.at, d.type, d.trial_id, d.detail].filter(Boolean).join(" ");
      list.prepend(item);
      while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
    });
  }

  function followLog(url) {
    const pre = document.getElementById("log");
    const source = openStream(url);
    source.addEventListener("log", (e) => {
      const d = JSON.parse(e.data);
      pre.append(document.createTextNode(d.text));
      if (pre.textContent.length > MAX_LOG_CHARS) {
        pre.textContent = pre.textContent.slice(-MAX_LOG_CHARS);
      }
    });
  }

  // The fleet and queue pages: the server re-reads them and pushes the part that
  // changed ({target, html}: an element id and its autoescaped fragment).
  function followPage(url) {
    const source = openStream(url);
    source.addEventListener("page", (e) => {
      const d = JSON.parse(e.data);
      const el = document.getElementById(d.target);
      if (el) el.innerHTML = d.html;
      setStatus("live");
      main.dataset.updates = String(Number(main.dataset.updates || "0") + 1);
    });
    source.addEventListener("unavailable", (e) => {
      setStatus(`not updating: ${JSON.parse(e.data).message}`);
    });
  }

  if (main.dataset.eventsUrl) followExperiment(main.dataset.eventsUrl);
  if (main.dataset.liveUrl) followPage(main.dataset.liveUrl);
  if (main.dataset.logUrl) followLog(main.dataset.logUrl);
})();
