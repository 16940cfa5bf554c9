// The qrun extension: the grammar and language configuration come from package.json; this
// file starts the language server, `qrun lsp` (docs/editor.md), over stdio for .tmpl files.
// Plain JavaScript on purpose: no build step, the folder is the extension.
"use strict";

const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const [command, ...args] = vscode.workspace
    .getConfiguration("qrun")
    .get("server.command", ["qrun", "lsp"]);
  const server = { command, args };
  client = new LanguageClient(
    "qrun",
    "qrun language server",
    { run: server, debug: server },
    { documentSelector: [{ scheme: "file", language: "qrun" }, { scheme: "untitled", language: "qrun" }] },
  );
  context.subscriptions.push(client);
  return client.start().catch((error) => {
    vscode.window.showErrorMessage(
      `qrun: could not start \`${[command, ...args].join(" ")}\` (${error.message}); ` +
        "install qrun with its lsp extra (pip install 'qrun[lsp]') or set qrun.server.command",
    );
  });
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
