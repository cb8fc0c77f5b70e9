# iop-node, the agent each Mac runs (docs/node-service.md). This repository is its tap:
#
#   brew tap iop-dev/iop https://github.com/iop-dev/iop
#   brew install iop-dev/iop/iop-node            # a release, once one is committed here
#   brew install --HEAD iop-dev/iop/iop-node     # main, until then
#
# No `url`/`sha256` here: a release's source tarball and its checksum exist only once the tag is
# built. The release workflow (.github/workflows/release.yml) packs the tag's source as
# iop-VERSION.tar.gz, and scripts/brew-formula writes this file with that tarball as its stable
# source (`url` and `sha256` after `homepage`); the result is attached to the release as
# iop-node.rb, and committing it here makes `brew install` (without --HEAD) install that
# release. A head-only formula is what `brew audit --strict` accepts outside homebrew-core, and
# .github/workflows/macos.yml audits both forms and installs and tests the stable one (built
# from the checkout's own tarball). iop-dev/iop: scripts/brew-formula puts the repository a
# release is built in there.
class IopNode < Formula
  desc "Agent that serves a Mac's local LLM servers to an IOP Edge over mutual TLS"
  homepage "https://github.com/iop-dev/iop"
  license "Apache-2.0"
  head "https://github.com/iop-dev/iop.git", branch: "main"

  depends_on "rust" => :build
  depends_on :macos

  def install
    system "cargo", "install", *std_cargo_args(path: "node")
  end

  def caveats
    <<~EOS
      Put the node bundle (`iop-operator node-bundle NODE ... --out DIR`, the files of DIR)
      into #{etc}/iop-node/, check it and start the node (now and at every login):
        iop-node doctor --config #{etc}/iop-node/node.yaml
        brew services start iop-node
      Log: #{var}/log/iop-node.log
    EOS
  end

  # The LaunchAgent `iop-node service install` writes (node/src/service/render.rs), with the
  # same label, so launchd never runs both: the one started last replaces the other's job
  # and plist file. Same keys: RunAtLoad (brew's default), KeepAlive {SuccessfulExit: false}
  # (a clean exit is a deliberate stop; a failure or crash is restarted), ThrottleInterval 10,
  # ProcessType Interactive (no throttling of a process that relays every streamed token), and
  # no EnvironmentVariables (launchd's default PATH). What differs:
  # - the logs are in var/log (iop-node.log, iop-node.out.log): launchd expands no `~`, and
  #   brew's service DSL cannot name the user's ~/Library/Logs;
  # - the config path is fixed (etc/iop-node/node.yaml) where `install --config` records any;
  # - the executable is opt_bin/iop-node, which `brew upgrade` repoints to the new version
  #   (`brew services restart iop-node` runs it);
  # - brew adds LimitLoadToSessionType, so the job also loads in a session without a desktop.
  service do
    name macos: "dev.iop.node"
    run [opt_bin/"iop-node", "--config", etc/"iop-node/node.yaml"]
    keep_alive successful_exit: false
    throttle_interval 10
    process_type :interactive
    log_path var/"log/iop-node.out.log"
    error_log_path var/"log/iop-node.log"
  end

  test do
    expected = version.head? ? /^iop-node \d+\.\d+\.\d+/ : "iop-node #{version}"
    assert_match expected, shell_output("#{bin}/iop-node --version")

    # `iop-node doctor` on a bundle made here, offline: a CA and a node certificate with the
    # node's SPIFFE identity, and an Edge address where nothing listens. Every check of the
    # files passes (config loader, PEM, validity, identity, key pair: rustls and ring at work);
    # the Edge's TCP check fails, so the exit code is 1.
    (testpath/"openssl.cnf").write <<~EOS
      [req]
      distinguished_name = dn
      prompt = no
      [dn]
      CN = iop-brew-test-ca
      [ca]
      basicConstraints = critical,CA:TRUE
      keyUsage = critical,keyCertSign,cRLSign
      [node]
      basicConstraints = critical,CA:FALSE
      keyUsage = critical,digitalSignature
      extendedKeyUsage = clientAuth
      subjectAltName = URI:spiffe://iop.local/node/brew-test
    EOS
    req = %w[req -config openssl.cnf -nodes -newkey rsa:2048]
    system "openssl", *req, "-x509", "-days", "30", "-extensions", "ca", "-keyout", "ca-key.pem", "-out", "ca.pem"
    system "openssl", *req, "-new", "-subj", "/CN=brew-test", "-keyout", "node-key.pem", "-out", "node.csr"
    sign = %w[-CA ca.pem -CAkey ca-key.pem -set_serial 2 -days 30 -extfile openssl.cnf -extensions node]
    system "openssl", "x509", "-req", "-in", "node.csr", *sign, "-out", "node.pem"
    chmod 0600, "node-key.pem"
    (testpath/"node.yaml").write <<~EOS
      edge: { url: "https://127.0.0.1:9" }
      tls: { ca_file: ca.pem, cert_file: node.pem, key_file: node-key.pem }
    EOS
    report = shell_output("#{bin}/iop-node doctor --config #{testpath}/node.yaml", 1)
    ["config", "tls.ca_file", "certificate", "identity", "tls.key_file", "key pair"].each do |check|
      assert_match(/^OK +#{Regexp.escape(check)} /, report)
    end
    assert_match "spiffe://iop.local/node/brew-test", report
    assert_match(/^FAIL +edge tcp /, report)
  end
end
