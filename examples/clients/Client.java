// A raw-socket AgentOS client in Java (17+), with nothing but its standard
// library: HELLO, NOOP, THINK and LIST over the 17-byte-header protocol.
//
//     java examples/clients/Client.java [SOCKET]

import java.io.IOException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;

public class Client {
    static final int MAGIC = 0x41474E54;

    public static void main(String[] args) throws IOException {
        String path = args.length > 0 ? args[0]
            : System.getenv().getOrDefault("AGENTOS_SOCKET", "/run/agentos/agentos.sock");
        try (SocketChannel channel = SocketChannel.open(StandardProtocolFamily.UNIX)) {
            channel.connect(UnixDomainSocketAddress.of(path));
            System.out.println("hello " + call(channel, 0xFE, ""));
            System.out.println("noop " + call(channel, 0x00, "ping"));
            System.out.println("think " + call(channel, 0x01, "What is 2+2?"));
            System.out.println("list " + call(channel, 0x12, ""));
        }
    }

    static String call(SocketChannel channel, int opcode, String payload) throws IOException {
        byte[] body = payload.getBytes(StandardCharsets.UTF_8);
        ByteBuffer request = ByteBuffer.allocate(17 + body.length).order(ByteOrder.LITTLE_ENDIAN);
        request.putInt(MAGIC).putInt(0).put((byte) opcode).putLong(body.length).put(body).flip();
        while (request.hasRemaining()) {
            channel.write(request);
        }
        ByteBuffer header = readExactly(channel, 17).order(ByteOrder.LITTLE_ENDIAN);
        if (header.getInt(0) != MAGIC) {
            throw new IOException("bad magic in a reply");
        }
        long length = header.getLong(9);
        return StandardCharsets.UTF_8.decode(readExactly(channel, (int) length)).toString();
    }

    static ByteBuffer readExactly(SocketChannel channel, int length) throws IOException {
        ByteBuffer buffer = ByteBuffer.allocate(length);
        while (buffer.hasRemaining()) {
            if (channel.read(buffer) < 0) {
                throw new IOException("the kernel closed the connection");
            }
        }
        return buffer.flip();
    }
}
