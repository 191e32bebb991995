// Debian's chromium driven by playwright-core (no browser download).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

export const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';

/**
 * A headless chromium with a fresh profile; `close()` removes the profile.
 * @returns {Promise<{context: import('playwright-core').BrowserContext, close: () => Promise<void>}>}
 */
export async function launch() {
  if (!fs.existsSync(CHROMIUM)) {
    throw new Error(`No chromium at ${CHROMIUM}: apt-get install -y chromium (or set $CHROMIUM).`);
  }
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'onnxtrain-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 820, height: 900 },
  });
  return {
    context,
    close: async () => {
      await context.close();
      fs.rmSync(profile, { recursive: true, force: true });
    },
  };
}
