// Search from file://: Chromium refuses `new Worker(file URL)`, so Material's search worker never starts and the
// search box stays at "Initializing search". Opened from disk, Worker becomes this stand-in: the worker's script
// runs in a hidden same-origin iframe (a <script src> loads from disk where a worker cannot), and messages go both
// ways as events. Served over http(s), the browser's own Worker is used. (Our file: the offline plugin would
// otherwise add a shim from a public host; mkdocs.yml names this one under extra.polyfills.)
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  class FileWorker extends EventTarget {
    constructor(url) {
      super();
      this.queue = [];
      this.frame = document.createElement("iframe");
      this.frame.hidden = true;
      this.frame.setAttribute("aria-hidden", "true");
      (document.body || document.documentElement).appendChild(this.frame);
      const scope = this.frame.contentWindow;
      // the worker's globals: postMessage answers us, importScripts loads more of its scripts in order
      scope.postMessage = (data) => setTimeout(() => this.dispatchEvent(new MessageEvent("message", { data })));
      scope.importScripts = () => {
        throw new Error("importScripts is not available from file://");
      };
      const script = scope.document.createElement("script");
      script.src = new URL(url, location.href).href;
      script.onload = () => {
        this.ready = true;
        this.queue.splice(0).forEach((data) => this.postMessage(data));
      };
      script.onerror = () => this.dispatchEvent(new Event("error"));
      scope.document.head.appendChild(script);
      this.scope = scope;
    }

    postMessage(data) {
      if (!this.ready) {
        this.queue.push(data);
        return;
      }
      this.scope.dispatchEvent(new this.scope.MessageEvent("message", { data }));
    }

    terminate() {
      this.frame.remove();
    }
  }

  window.Worker = FileWorker;
})();
