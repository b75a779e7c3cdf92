// modelc's chat page registers no service worker. A browser that kept one from another page
// served at this address before (llama-server's web UI registers /sw.js) checks here for its
// update: this worker replaces it, removes itself and its caches, and reloads the pages it
// held, so that they show what this server serves.
self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => {
  event.waitUntil((async () => {
    await self.registration.unregister();
    for (const name of await caches.keys()) await caches.delete(name);
    for (const page of await self.clients.matchAll({ type: "window" })) page.navigate(page.url);
  })());
});
