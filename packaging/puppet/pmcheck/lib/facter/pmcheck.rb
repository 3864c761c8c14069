# frozen_string_literal: true

# Fact pmcheck: what the pmcheck daemon on this node answers now, read from its /status on
# loopback (the port of PMCHECK_LISTEN in its settings file), and the backend this node is a
# member of (/etc/pmcheck/member, written by class pmcheck while it exports the node). Class
# pmcheck exports a compile master only once this shows status 200 (PuppetDB stores a catalog's
# exports before the catalog is applied), and withdraws a retiring one once its drain is safe to
# stop. Absent where pmcheck is not installed.
#
#   { "status" => 200, "verdict" => "OK", "version" => "0.1.0", "drained" => false,
#     "safe_to_stop" => false, "member" => "puppetserver_compilers" }
#
# When the daemon cannot be asked, "error" says why and "status" is absent.
require 'json'
require 'net/http'

Facter.add(:pmcheck) do
  confine kernel: 'Linux'
  setcode do
    settings = ['/etc/default/pmcheck', '/etc/sysconfig/pmcheck'].find { |f| File.file?(f) }
    next nil if settings.nil?

    listen = File.foreach(settings).map { |l| l[/\A\s*PMCHECK_LISTEN=["']?([^,"'\s]+)/, 1] }.compact.last
    host, port = (listen || '[::]:9200').match(/\A\[?(.*?)\]?:(\d+)\z/)&.captures
    host = '127.0.0.1' if host.nil? || ['', '::', '0.0.0.0'].include?(host)
    member = '/etc/pmcheck/member'
    fact = { 'member' => File.file?(member) ? File.read(member).strip : nil }
    begin
      http = Net::HTTP.new(host, (port || 9200).to_i)
      http.open_timeout = 2
      http.read_timeout = 2
      status = JSON.parse(http.get('/status', 'User-Agent' => 'pmcheck-fact').body)
      drain = status['drain']
      fact.merge!(
        'status' => status['status'],
        'verdict' => status['verdict'],
        'version' => status['version'],
        'drained' => !drain.nil? && !drain['expired'],
        'safe_to_stop' => status.dig('progress', 'safe_to_stop') == true,
      )
    rescue StandardError => e
      fact['error'] = "http://#{host}:#{port}/status: #{e.message}"
    end
    fact.compact
  end
end
